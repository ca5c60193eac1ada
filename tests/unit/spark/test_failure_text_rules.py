"""The line rules of `spark.failure_text.described`, on texts shaped like Spark's failures:
what is dropped (Java frames, py4j and pyspark frames with their source lines, the query's
plan, repeats) and what must stay (the cause, wherever it is; frames without source lines;
message lines that only look like frames; any other error's text as it is)."""

from __future__ import annotations

import pytest

from cdcflow.spark.failure_text import described

pytestmark = pytest.mark.unit

PY4J = '  File "/v/lib/python3.11/site-packages/py4j/protocol.py", line 327, in get_return_value'


def test_java_and_library_frames_and_the_plan_go_and_the_cause_stays():
    text = "\n".join([
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent "
        "call last):", PY4J, "    raise Py4JJavaError(", "    ^^^^^^^^^^^^^^^^^^^",
        "py4j.protocol.Py4JJavaError: An error occurred while calling o44.collectToPython.",
        ": org.apache.spark.SparkException: Job aborted: ExecutorLostFailure (executor 1)",
        "\tat org.apache.spark.scheduler.DAGScheduler.failJob(DAGScheduler.scala:2935)",
        "\tat java.base/java.lang.Thread.run(Thread.java:840)", "\t... 21 more",
        "Caused by: java.io.EOFException", "Caused by: java.io.EOFException",
        "=== Streaming Query ===", "Identifier: [id = 1]", "Logical Plan: a long one"])
    kept = described(RuntimeError(text)).splitlines()
    assert kept == [
        "RuntimeError: An exception was raised by the Python Proxy. Return Message: Traceback "
        "(most recent call last):",
        "py4j.protocol.Py4JJavaError: An error occurred while calling o44.collectToPython.",
        ": org.apache.spark.SparkException: Job aborted: ExecutorLostFailure (executor 1)",
        "Caused by: java.io.EOFException"]


def test_the_cause_at_the_end_of_a_long_text_stays():
    frames = [f'  File "/app/cdcflow/m{i}.py", line {i}, in f{i}\n    g{i}()' for i in range(200)]
    text = "\n".join(["py4j.protocol.Py4JJavaError: in a task", *frames,
                      "ValueError: THE CAUSE"])
    kept = described(RuntimeError(text), limit=1000)
    assert len(kept) == 1000
    assert kept.startswith("RuntimeError: py4j.protocol.Py4JJavaError: in a task")
    assert kept.endswith("ValueError: THE CAUSE") and "…" in kept


def test_lines_after_a_library_frame_stay_unless_they_are_its_source():
    """Fault-handler output and tracebacks without source lines: the next line is a frame
    or the exception, not the library frame's source."""
    crash = "\n".join([
        "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed): "
        "Fatal Python error: Segmentation fault",
        '  File "/x/site-packages/pyspark/worker.py", line 88 in main',
        '  File "/app/cdcflow/spark/keyed_batch.py", line 40 in _share_rows',
        PY4J,
        "py4j.protocol.Py4JJavaError: An error occurred while calling o57.start."])
    kept = described(RuntimeError(crash))
    assert "keyed_batch.py\", line 40 in _share_rows" in kept
    assert kept.endswith("py4j.protocol.Py4JJavaError: An error occurred while calling o57.start.")
    assert "worker.py" not in kept and "protocol.py" not in kept


def test_message_lines_that_look_like_frames_stay():
    text = ("org.apache.spark.SparkException: refused\n  at the driver's request\n"
            "\tat org.apache.spark.Foo.bar(Foo.scala:1)")
    assert described(RuntimeError(text)).splitlines() == [
        "RuntimeError: org.apache.spark.SparkException: refused", "  at the driver's request"]


def test_another_errors_text_is_kept_as_it_is():
    text = "2 validation errors\na\n  Field required\n\nb\n  Field required\n       ^"
    assert described(ValueError(text)) == f"ValueError: {text}"


def test_a_long_text_keeps_its_start_and_its_end():
    text = described(RuntimeError("start " + "x" * 10_000 + " end"), limit=100)
    assert len(text) == 100
    assert text.startswith("RuntimeError: start xx") and text.endswith("xx end")
