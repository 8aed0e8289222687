"""Postgres's statistics of the tables retrieval reads: kept current by the ingest workers;
full text's term shares read from them by searches.

Full text chooses and ranks its candidates by how many chunks hold each of the question's
terms (search.CHOSEN_TERMS). Those shares are ANALYZE's statistics of chunks.tsv (pg_stats'
most common lexemes), cheap to read and cached; counting terms at search time would cost a
scan of the matches. Postgres's autovacuum analyses a table once 50 rows and a tenth of it
have changed, at most once a minute, so a new deployment's first documents were searched with
no statistics at all: every term ranked, common or not, and a server that had looked kept that
answer for five minutes. On the labelled set (`footnote eval` right after its upload)
retrieval ranked an expected passage first for 44 of the 54 answerable questions instead of
39 once the table was analysed, and one more answer cited the right place (q048, whose answer
went from 7th to 1st; docs/quality.md). The planner needs statistics too: the vector query
joins `documents`, and with neither table analysed it searched an assistant of 10,000 chunks
(random vectors) by a bitmap scan and a sort in 217 ms, with chunks analysed 17 ms, with both
through the HNSW index in 3.8 ms.

So the worker that makes a document READY analyses each of chunks and documents that has no
statistics yet or has changed by as many rows as it held at its last analysis
(`analyze_when_grown`): a few times in a table's life, each ANALYZE reading a sample of at
most 30,000 rows. Searches re-read the term shares every TERM_STATS_SECONDS, and every
TERM_STATS_MISSING_SECONDS while there are none, so the first ones are used at once.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from dataclasses import dataclass

from sqlalchemy import Connection, text
from sqlalchemy.exc import OperationalError

from services.db.session import Reader, connection_of
from services.llm.stems import stem_word

log = logging.getLogger(__name__)

# Statistics are re-read this often (reading them takes half a millisecond: a thousand terms
# and their shares), so that a new analysis is used within a minute; missing ones this often,
# until there are some.
TERM_STATS_SECONDS = 60.0
TERM_STATS_MISSING_SECONDS = 5.0
# How long analysing waits for the table: another ANALYZE, a VACUUM or an index build (which
# takes minutes) holds the lock ANALYZE needs, and the statistics they leave will do.
ANALYZE_LOCK_TIMEOUT = "200ms"

# The shares end with three more numbers (two bounds and the share of NULLs), which pair with
# no term; the least share of a listed term bounds every term left out.
TERM_STATS_SQL = text(
    """
    SELECT CAST(CAST(most_common_elems AS text) AS text[]) AS terms,
           most_common_elem_freqs AS shares,
           (SELECT min(f) FROM unnest(
              most_common_elem_freqs[1:array_length(most_common_elem_freqs, 1) - 3]) AS f
           ) AS least
    FROM pg_stats
    WHERE schemaname = current_schema() AND tablename = 'chunks' AND attname = 'tsv'
    """
)
# The tables the worker analyses, and which of them want it: no statistics, or as many rows
# changed since the last analysis as the table held then (reltuples; -1 before any). The change
# count is the cumulative statistics system's, which a backend reports within a second or so
# of committing.
ANALYZED_TABLES = ("chunks", "documents")
STALE_SQL = text(
    """
    SELECT t.name
    FROM unnest(CAST(:tables AS text[])) WITH ORDINALITY AS t(name, n)
    JOIN pg_class c ON c.oid = to_regclass(t.name)
    LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
    WHERE NOT EXISTS (
            SELECT 1 FROM pg_stats p
            WHERE p.schemaname = current_schema() AND p.tablename = t.name)
       OR coalesce(s.n_mod_since_analyze, 0) > greatest(c.reltuples, 0)
    ORDER BY t.n
    """
)

# Words as Postgres's parser splits them (letters and digits: an underscore separates), and
# hyphenated words whole, which it stems as well as their parts ("sort-by" gives "sort-bi").
_WORDS = re.compile(r"[^\W_]+(?:-[^\W_]+)*")
# Runs of letters: Postgres's parser also splits a word where letters follow digits ("4.3BSD").
_LETTERS = re.compile(r"[^\W\d_]+")


@dataclass(frozen=True)
class TermShares:
    """The commonest lexemes of chunks.tsv with the share of chunks holding each, and a share
    for every other lexeme (floor): no lexemes and a share of 0 while there are no statistics."""

    shares: dict[str, float]
    floor: float = 0.0

    def of(self, question: str) -> tuple[list[str], list[float]]:
        """The lexemes the question may hold and their shares, for search.CHOSEN_TERMS.

        Postgres turns each word into its Snowball stem and any other token (a number, a
        host, a path, a part of a hyphenated word) into its lowercase self. Its Snowball is not
        always ours: it stems "organization" to "organ", where ours gives "organiz", but such
        a stem is still the start of its run of letters. So the listed lexemes given are the
        stems of the question's words, the starts of its runs of letters, and the lexemes that
        are not all letters found anywhere in its lowercase text; the query pairs them with
        the lexemes Postgres finds. A lexeme left out would only count as rare; on the 900
        questions of the manual-page corpus and the labelled set the terms chosen were the same
        as with every lexeme given. Testing each listed lexeme (up to a thousand) against the
        text instead gave the same lexemes that Postgres finds, for 3,964 questions and chunks,
        in twice the time (0.18 against 0.1 ms for a question).
        """
        lowered = question.lower()
        words = _WORDS.findall(lowered)
        parts = {part for word in words for part in (word, *word.split("-"))}
        shares = self.shares
        found = {stem for part in parts if (stem := stem_word(part)) in shares}
        found.update(
            start
            for run in set(_LETTERS.findall(lowered))
            for end in range(1, len(run) + 1)
            if (start := run[:end]) in shares
        )
        found.update(term for term in self._pieces if term in lowered)
        ordered = sorted(found)
        return ordered, [shares[term] for term in ordered]

    @functools.cached_property
    def _pieces(self) -> list[str]:
        """The listed lexemes that are not all letters: numbers, hosts, paths, hyphenated."""
        return [term for term in self.shares if not term.isalpha()]


NO_TERM_SHARES = TermShares({})
_term_stats: dict[str, tuple[float, TermShares]] = {}


def term_frequencies(s: Reader) -> TermShares:
    """The term shares of chunks.tsv, read from pg_stats and cached per database."""
    key = str(connection_of(s).engine.url)
    now = time.monotonic()
    cached = _term_stats.get(key)
    if cached is not None and cached[0] > now:
        return cached[1]
    row = s.execute(TERM_STATS_SQL).first()
    stats, ttl = NO_TERM_SHARES, TERM_STATS_MISSING_SECONDS
    if row is not None and row.terms:
        # A term left out of the list is rarer than every term on it.
        stats = TermShares(dict(zip(row.terms, row.shares, strict=False)), float(row.least) / 2)
        ttl = TERM_STATS_SECONDS
    _term_stats[key] = (now + ttl, stats)
    return stats


def analyze_when_grown(conn: Connection) -> list[str]:
    """ANALYZE each of ANALYZED_TABLES that has no statistics yet or has changed by as many rows
    as it held at its last analysis; the tables analysed. Commits. A table that something else
    holds for longer than ANALYZE_LOCK_TIMEOUT is left for later."""
    stale = list(conn.execute(STALE_SQL, {"tables": list(ANALYZED_TABLES)}).scalars())
    conn.rollback()
    analysed = []
    for table in stale:
        conn.execute(
            text("SELECT set_config('lock_timeout', :t, true)"), {"t": ANALYZE_LOCK_TIMEOUT}
        )
        try:
            conn.execute(text(f"ANALYZE {table}"))  # a name from ANALYZED_TABLES
        except OperationalError as exc:
            conn.rollback()
            if getattr(exc.orig, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            log.info("%s is busy (an ANALYZE, VACUUM or index build); not analysed now", table)
            continue
        conn.commit()
        analysed.append(table)
    return analysed
