"""`mtbench init-weights` as users call it with a train command line's options."""

from conftest import assert_refused_in_one_line, run_cli


def test_a_tracker_that_does_not_exist_is_refused_in_one_line(tmp_path, cache_dir):
    """`--report-to` came from train's options and was accepted without a word, whatever it named. A tracker that
    exists follows nothing here (compare passes its runs' trackers on to the weights it draws for them)."""
    out = tmp_path / "w.npz"
    proc = run_cli("init-weights", "--preset", "tiny", "--report-to", "nope", "--cache-dir", cache_dir, "--out",
                   str(out))
    assert_refused_in_one_line(proc, "reporter 'nope'")
    assert not out.exists()
