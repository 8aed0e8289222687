"""The retrieval gate: messages such as greetings need no documents, so they skip retrieval."""

from __future__ import annotations

import re

SMALL_TALK = re.compile(
    r"""^(?:
        hi|hello|hey|hiya|howdy|yo|greetings|good\s+(?:morning|afternoon|evening|day)
      | thanks?|thank\s+you|thx|ty|cheers|much\s+appreciated
      | bye|goodbye|see\s+you|later|good\s*night
      | ok(?:ay)?|cool|great|nice|got\s+it|understood|sounds\s+good|perfect|awesome
      | yes|no|yep|nope|sure
      | how\s+are\s+you|who\s+are\s+you|what\s+can\s+you\s+do
    )(?:\s+(?:there|all|everyone|again|so\s+much|a\s+lot|very\s+much))?
    (?:\s*[,!.?]*\s*(?:thanks?|thank\s+you))?
    [\s!.?,:;)(*]*$""",
    re.IGNORECASE | re.VERBOSE,
)


def needs_retrieval(message: str) -> bool:
    """False only for short small talk; anything that may be a real question retrieves."""
    text = " ".join(message.split())
    return not (len(text) <= 60 and SMALL_TALK.match(text))
