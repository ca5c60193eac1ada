"""A Spark failure's text, short enough to record whole, with its cause kept."""

from __future__ import annotations

import re

MESSAGE_LIMIT = 4000
"""The longest error text the runner records (`described`)."""
_JAVA_FRAME = re.compile(r"\s+(at [\w$.<>/-]+\(.*\)|\.\.\. \d+ more)")
_CARETS = re.compile(r"\s*[\^~]+\s*")
_LIBRARY_FRAME = re.compile(r'(\s*)File "[^"]*/((site|dist)-packages/(py4j|pyspark)|'
                            r'pyspark\.zip/pyspark|py4j-[^/"]*\.zip/py4j)/')
_SPARK_MARKS = ("py4j", "org.apache.spark", "=== Streaming Query ===")
_QUERY_SECTION = "\n=== Streaming Query ==="


def described(error: BaseException, limit: int = MESSAGE_LIMIT) -> str:
    """An error as the catalog records it: its type and text, at most `limit` characters
    (its start and its end, where an exception's cause is). A Spark failure's text runs to
    many thousand characters, mostly Java stack frames, the frames of py4j and pyspark and
    the query's plan; the cause (the executor's exception, a worker that crashed, a lost
    executor) is a line among them. Those are dropped, and repeated lines kept once; any
    other error's text is kept as it is."""
    text = f"{type(error).__name__}: {error}"
    if any(mark in text for mark in _SPARK_MARKS):
        text = _without_frames(text.split(_QUERY_SECTION, 1)[0])
    if len(text) <= limit:
        return text
    head = limit * 2 // 5
    return f"{text[:head]}…{text[len(text) - (limit - head - 1):]}"


def _without_frames(text: str) -> str:
    """A Spark failure's lines less Java frames, py4j and pyspark frames (with the source
    line under each, when there is one), caret lines and repeats."""
    kept: list[str] = []
    seen: set[str] = set()
    frame_indent: int | None = None  # a library frame's, whose source line may follow
    for line in text.splitlines():
        indent = len(line) - len(line.lstrip())
        under_frame, frame_indent = frame_indent, None
        if (under_frame is not None and indent > under_frame
                and not line.lstrip().startswith('File "')):
            continue
        library = _LIBRARY_FRAME.match(line)
        if library:
            frame_indent = len(library.group(1))
            continue
        if _JAVA_FRAME.fullmatch(line) or _CARETS.fullmatch(line) or (
                line.strip() and line in seen):
            continue
        seen.add(line)
        kept.append(line)
    return "\n".join(kept)
