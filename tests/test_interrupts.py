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
