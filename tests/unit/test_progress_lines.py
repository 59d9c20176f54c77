"""Progress in a log (stderr no terminal): one plain line per finished bar, never tqdm's redraws."""

from memcl.pipeline.progress import Progress


def test_a_bar_in_a_log_is_one_line_when_done(capsys):
    progress = Progress()
    assert not progress.terminal  # pytest captures stderr
    bar = progress.bar("encode train", 3, unit="batch")
    for _ in range(3):
        bar.update(1)
    progress.note("a note between")
    bar.close()
    assert capsys.readouterr().err.splitlines() == ["a note between", "encode train: 3/3 batch (0 s)"]


def test_a_passing_bar_leaves_nothing_and_a_disabled_one_prints_nothing(capsys):
    quick = Progress().bar("answer", 2, leave=False)
    quick.update(2)
    quick.close()
    silent = Progress(enabled=False).bar("x", 1)
    silent.update(1)
    silent.close()
    assert capsys.readouterr().err == ""
