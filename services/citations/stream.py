"""Turns streamed answer pieces into deltas that never end inside a citation marker."""

from __future__ import annotations

from dataclasses import dataclass

from services.citations.extract import MARKER_START, Extraction, Marker, Scanner


@dataclass(frozen=True, slots=True)
class Delta:
    """Answer text ready to show; deltas concatenate to the final text."""

    text: str


@dataclass(frozen=True, slots=True)
class CitationEvent:
    """A source cited for the first time, sent right after the delta holding its marker.

    start and end locate that marker in the final text (code points, end exclusive).
    """

    index: int
    start: int
    end: int


StreamEvent = Delta | CitationEvent


class MarkerBuffer:
    """Holds back text that might still turn out to be (part of) a marker.

    feed() takes each upstream piece and returns events; finish() releases whatever is held.
    The deltas concatenate to extract(text).text for the concatenated pieces, each marker lies
    wholly inside one delta, and there is one CitationEvent per source index, the first time
    a valid marker cites it. Text that cannot contain a marker ("[" or "【") is passed on even
    while the scanner waits, e.g. for the end of a code span, so deltas only stall at brackets.
    """

    def __init__(self, n_sources: int, *, strip_invalid: bool = False) -> None:
        self._scanner = Scanner(n_sources, strip_invalid=strip_invalid)
        self._pending = ""  # input the scanner has not settled yet
        self._base = 0  # where _pending starts in the whole input
        self._ahead = 0  # leading code points of _pending already sent as plain text
        self._raw: list[str] = []
        self._out: list[str] = []
        self._markers: list[Marker] = []
        self._announced: set[int] = set()
        self._result: Extraction | None = None

    @property
    def text(self) -> str:
        """The raw upstream text received so far."""
        return "".join(self._raw)

    @property
    def output(self) -> str:
        """The text sent in deltas so far."""
        return "".join(self._out)

    @property
    def markers(self) -> tuple[Marker, ...]:
        """The markers found so far, positioned in output."""
        return tuple(self._markers)

    def feed(self, piece: str) -> list[StreamEvent]:
        if self._result is not None:
            raise RuntimeError("feed() after finish()")
        if not piece:
            return []
        self._raw.append(piece)
        if not self._pending and self._scanner.pass_plain(piece):
            self._base += len(piece)
            self._out.append(piece)
            return [Delta(piece)]
        self._pending += piece
        return self._advance(final=False)

    def finish(self) -> list[StreamEvent]:
        if self._result is not None:
            raise RuntimeError("finish() called twice")
        events = self._advance(final=True)
        self._result = self._scanner.result("".join(self._out), self._markers)
        return events

    def result(self) -> Extraction:
        """The extraction of the whole answer, identical to extract() on the joined pieces."""
        if self._result is None:
            raise RuntimeError("result() before finish()")
        return self._result

    def _advance(self, final: bool) -> list[StreamEvent]:
        buf = self._pending
        settled = self._scanner.scan(buf, 0, final, self._base)
        events: list[StreamEvent] = []
        delta: list[str] = []
        # The scanner re-emits the plain text sent ahead of it; markers never fall in there
        # because sending ahead stops at the first bracket.
        skip = min(self._ahead, settled)
        for item in self._scanner.drain():
            if isinstance(item, str):
                text = item
                if skip:
                    cut = min(skip, len(text))
                    skip -= cut
                    text = text[cut:]
                if text:
                    delta.append(text)
                    self._out.append(text)
                continue
            self._markers.append(item)
            if item.text:
                delta.append(item.text)
                self._out.append(item.text)
            fresh = [index for index in item.indices if index not in self._announced]
            if fresh:
                self._flush(delta, events)
                self._announced.update(fresh)
                events.extend(CitationEvent(index, item.start, item.end) for index in fresh)
        self._ahead -= min(self._ahead, settled)
        self._pending = buf[settled:]
        self._base += settled
        if not final:
            m = MARKER_START.search(self._pending, self._ahead)
            stop = m.start() if m else len(self._pending)
            if stop > self._ahead:
                text = self._pending[self._ahead : stop]
                delta.append(text)
                self._out.append(text)
                self._ahead = stop
        self._flush(delta, events)
        return events

    @staticmethod
    def _flush(delta: list[str], events: list[StreamEvent]) -> None:
        if delta:
            events.append(Delta("".join(delta)))
            delta.clear()
