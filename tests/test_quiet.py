"""raylab's driver output stays whole lines while another thread prints (raylab.quiet)."""

from __future__ import annotations

import io
import threading

from raylab.quiet import WholeLines


def _splice(stream) -> str:
    """Thread A prints its line while thread B prints between A's text and A's newline (the
    two calls `print` makes): Ray's log thread against raylab's final line."""
    text_written, b_done = threading.Event(), threading.Event()

    class Gate:  # pauses A after its text
        def __init__(self, s):
            self.s = s

        def write(self, t):
            n = self.s.write(t)
            if t.startswith("raylab:"):
                text_written.set()
                b_done.wait(5)
            return n

        def flush(self):
            self.s.flush()

    def a():
        print("raylab: training failed: ValueError: NaN", file=Gate(stream), flush=True)

    def b():
        text_written.wait(5)
        print("(RaylabPPO pid=1) actor died", file=stream, flush=True)
        b_done.set()

    ta, tb = threading.Thread(target=a), threading.Thread(target=b)
    ta.start(), tb.start()
    ta.join(), tb.join()


def test_two_threads_printing_at_once_keep_their_lines_whole():
    raw = io.StringIO()
    _splice(WholeLines(raw))
    assert sorted(raw.getvalue().splitlines()) == [
        "(RaylabPPO pid=1) actor died",
        "raylab: training failed: ValueError: NaN",
    ]
    spliced = io.StringIO()  # the same without WholeLines: the lines splice (the test's premise)
    _splice(spliced)
    assert spliced.getvalue().splitlines()[0].endswith("NaN(RaylabPPO pid=1) actor died")


def test_an_unfinished_line_is_written_at_flush_and_the_stream_is_the_wrapped_one():
    raw = io.StringIO()
    out = WholeLines(raw)
    out.write("progress 3/10")
    assert raw.getvalue() == ""
    out.flush()
    assert raw.getvalue() == "progress 3/10"
    t = threading.Thread(target=out.write, args=("held by another thread",))
    t.start(), t.join()
    out.flush_all()
    assert raw.getvalue().endswith("held by another thread")
    assert out.getvalue() is not None and out.closed is False  # the wrapped stream's attributes
