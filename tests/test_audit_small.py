"""The audit's smaller cases: each a clear message instead of a raw error."""

from tfaccel import cli


def test_tune_batch_size_refuses_a_file_that_is_not_a_python_script(tmp_path, capsys):
    notes = tmp_path / "NOTES.md"
    notes.write_text("Run with --tune-batch-size to probe.\n")
    assert cli.main(["tune-batch-size", str(notes)]) == 2
    err = capsys.readouterr().err
    assert "NOTES.md" in err and "not a Python script" in err
