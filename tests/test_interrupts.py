"""The command line's signal handler (autotune/interrupts.py), in this process."""

from __future__ import annotations

import os
import signal

import pytest

from autotune.interrupts import Interrupted, handling


def test_handlers_are_restored_when_no_signal_came():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with handling() as handler:
        assert signal.getsignal(signal.SIGINT) is handler
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_after_a_signal_the_handler_stays_so_a_second_one_ends_at_once():
    """Once a signal came, the handler stays installed after the block: a second Ctrl-C during
    the shutdown that follows exits 130 at once (not Python's own KeyboardInterrupt death by
    SIGINT, exit -2, which is what CI saw when the handler had been restored)."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(Interrupted) as info, handling() as handler:
            os.kill(os.getpid(), signal.SIGINT)
            signal.sigtimedwait([], 0)  # let the handler run (Python runs it between bytecodes)
        assert info.value.exit_code == 130
        assert handler.received == signal.SIGINT
        assert signal.getsignal(signal.SIGINT) is handler
        assert signal.getsignal(signal.SIGTERM) is handler
    finally:
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])


@pytest.mark.parametrize("signalled", [True, False], ids=["after a signal", "no signal"])
def test_after_a_signal_the_process_ends_without_the_interpreters_teardown(signalled):
    """After a signal, end_process exits at once (os._exit: no atexit, no teardown, in which
    Python puts the default handlers back and a second Ctrl-C would end the process by SIGINT,
    exit -2, as CI saw once); without one, it exits through the usual teardown."""
    import subprocess
    import sys

    code = (
        "import atexit, os, signal\n"
        "from autotune.interrupts import Interrupted, end_process, handling\n"
        "atexit.register(lambda: os.write(1, b'teardown'))\n"
        f"if {signalled}:\n"
        "    try:\n"
        "        with handling():\n"
        "            os.kill(os.getpid(), signal.SIGINT)\n"
        "            signal.sigtimedwait([], 0)\n"
        "    except Interrupted as e:\n"
        "        end_process(e.exit_code)\n"
        "end_process(3)\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         check=False)
    assert run.returncode == (130 if signalled else 3), run
    assert ("teardown" in run.stdout) is not signalled, run
