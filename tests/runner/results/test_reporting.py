"""What reporters are handed: a console with rich's markup on, as the plugin guide has always given it, printing
where mtbench's own console prints, which reads no markup (the text it prints is shown as given)."""

import io

from rich.console import Console

from mtbench.runner.results.reporting import reporters_console


def test_a_reporter_prints_richs_markup_where_mtbench_prints_text_as_given():
    out = io.StringIO()
    console = Console(file=out, markup=False, width=120)
    reporters_console(console).print("[bold]done[/bold]: corp.tsv")
    console.print("corp[red].tsv")
    assert out.getvalue() == "done: corp.tsv\ncorp[red].tsv\n"
    quiet = Console(file=out, quiet=True)  # a process of several that is not the first prints nothing
    reporters_console(quiet).print("nothing")
    assert out.getvalue().count("\n") == 2 and reporters_console(console).width == 120
