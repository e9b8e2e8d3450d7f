"""scripts/host_pages.py on this host: a fresh mapping of a bank case faults its pages in as it is read, one
populated first (the stage's host work) does not; a new host tensor faults in as it is written."""

import os
import re

import pytest


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm here")
def test_host_pages_measures_what_populate_and_reserve_move_out_of_the_turns(load_script, capsys):
    assert load_script("host_pages").main(["softmax", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    faults = {label.strip(): int(n) for label, n in re.findall(r"^  (.+?)\s+[\d.]+ ms \((\d+) faults\)", out, re.M)}
    assert set(faults) == {"inputs read from a fresh mapping", "populate a fresh mapping (host work)",
                           "inputs read once populated", "inputs read again, same mapping",
                           "outputs written into new memory", "outputs written into written memory"}, out
    assert faults["inputs read once populated"] * 10 < faults["inputs read from a fresh mapping"], out
    assert faults["outputs written into written memory"] * 10 < faults["outputs written into new memory"], out
