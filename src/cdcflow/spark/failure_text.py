"""A Spark failure's text, short enough to record whole, with its cause kept."""

from __future__ import annotations

import re

MESSAGE_LIMIT = 4000
"""The longest error text the runner records (`described`)."""
_JAVA_FRAME = re.compile(r"\s+(at |\.\.\. \d+ more$)")
_CARETS = re.compile(r"\s*[\^~]+\s*$")
_LIBRARY_FRAME = re.compile(r'\s*File "[^"]*/site-packages/(py4j|pyspark)/')
_QUERY_SECTION = "\n=== Streaming Query ==="


def described(error: BaseException, limit: int = MESSAGE_LIMIT) -> str:
    """An error as the catalog records it: its type and text, less what hides the cause in
    a Spark failure. Those texts run to many thousand characters, mostly Java stack frames,
    the driver's frames in py4j and pyspark, and the query's plan; the cause (the executor's
    exception, a worker that crashed, a lost executor) is a line among them. Kept: every
    other line once, in order, up to `limit` characters."""
    text = f"{type(error).__name__}: {error}".split(_QUERY_SECTION, 1)[0]
    kept: list[str] = []
    seen: set[str] = set()
    skip_code = False
    for line in text.splitlines():
        if skip_code:  # the source line under a library frame
            skip_code = False
            continue
        if _LIBRARY_FRAME.match(line):
            skip_code = True
            continue
        if _JAVA_FRAME.match(line) or _CARETS.fullmatch(line) or line in seen:
            continue
        seen.add(line)
        kept.append(line)
    summary = "\n".join(kept)
    return summary if len(summary) <= limit else f"{summary[:limit - 1]}…"
