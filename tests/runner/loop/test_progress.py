"""What a run prints as it trains: each validation's line and its sample, and the table's best validation."""

from mtbench.plugins.reporters.table_reporter import _best_rows
from mtbench.runner.loop.progress import validation_line


def test_a_validation_line_gives_the_loss_to_four_decimals_as_the_step_lines_do():
    """'.4g' read 'loss 2.9' for 2.9000 (and 'best validation loss 2.9'), where the step lines read 'loss 2.9000'
    and the docstring promised 'loss 1.2345'."""
    line = validation_line(120, {"loss": 2.9, "perplexity": 18.17435, "bits_per_byte": 4.18266})
    assert line == "validation at step 120: loss 2.9000, perplexity 18.17, bits per byte 4.183"
    assert validation_line(4, {"bleu": 12.3456, "chrf": 30.5}) == "validation at step 4: bleu 12.35, chrf 30.5"
    target = {"metric": "loss", "best": {"step": 120, "loss": 2.9, "saved": None}}
    assert _best_rows(target) == [("quality", "best validation loss", "2.9000 at step 120")]
    bleu = {"metric": "bleu", "best": {"step": 8, "bleu": 12.3456}}
    assert _best_rows(bleu) == [("quality", "best validation BLEU", "12.35 at step 8")]


def test_a_samples_control_characters_are_escaped_on_the_console_and_its_lines_and_tabs_kept():
    """A byte-level model draws any byte: a backspace ate the character before it on the console, and a NUL made
    grep take the log for a binary file."""
    sample = "And God\x08 said\x00, Let\tthere be\r\nlight\x1b[2J\x7f\x85 é\ufffd"
    line = validation_line(6, {"loss": 1.23456, "sample": sample})
    assert line == ("validation at step 6: loss 1.2346\nsample: And God\\x08 said\\x00, Let\tthere be\\x0d\nlight"
                    "\\x1b[2J\\x7f\\x85 é\ufffd")
    assert all(c.isprintable() or c in "\n\t" for c in line)
