"""The run's journal (pipeline/journal.py): records appended per committed round, cut back to what a checkpoint
counted, so a resumed run neither repeats nor drops a record; the run state a checkpoint copies holds only counts."""

import json

import pytest

from memcl.pipeline.journal import Journal
from memcl.pipeline.roles import RunState


def test_a_resumed_run_cuts_the_journal_back_to_its_checkpoint_and_appends_from_there(tmp_path):
    journal = Journal(tmp_path)
    for r in range(3):
        journal.append("round_log", [{"round": r}])
        journal.append("acc_rows", [[0.5, float("nan")]] * (r % 2))  # a round may add no row
    counts = {"round_log": 2, "acc_rows": 1}  # the checkpoint after round 1
    with open(journal.folder / "round_log.jsonl", "a") as f:
        f.write('{"round": 3, "half')  # a driver killed mid-append
    journal.cut(counts)
    assert [e["round"] for e in journal.read("round_log")] == [0, 1]
    assert len(journal.read("acc_rows")) == 1 and journal.read("curve") == []
    journal.append("round_log", [{"round": 2}])
    assert [e["round"] for e in journal.read("round_log")] == [0, 1, 2]
    with pytest.raises(ValueError, match="holds fewer"):
        journal.cut({"round_log": 5})


def test_the_checkpointed_run_state_does_not_grow_with_the_rounds(tmp_path):
    state = RunState()
    state.store = Journal(tmp_path)
    sizes = []
    for r in range(200):
        state.append("round_log", [{"round": r, "memory": {"slots": 1000 + r}, "seconds": {"stream": 0.1}}])
        state.append("acc_rows", [[0.1 * (r % 10)] * 20])
        state.next_round = r + 1
        sizes.append(len(json.dumps(state.to_json())))
    assert sizes[-1] - sizes[9] < 10  # the counts' digits, not the records
    assert state.count("round_log") == 200 and len(state.records("acc_rows")) == 200
    assert "store" not in state.to_json()
    RunState(**state.to_json())  # what a resume rebuilds it from
