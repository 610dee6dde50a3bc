"""docs/cli.md, the option reference, is what the click commands say: generated from them, so it cannot drift."""

from conftest import load_docs_script


def load_generator():
    return load_docs_script("generate_cli_reference.py")


def test_the_option_reference_is_generated_from_the_commands():
    generator = load_generator()
    with open(generator.PATH, encoding="utf-8") as f:
        written = f.read()
    assert written == generator.render(), (
        "docs/cli.md differs from the commands' --help: regenerate it with python docs/generate_cli_reference.py")


def test_the_reference_names_every_command_and_option():
    from mtbench.cli import main

    text = load_generator().render()
    for name, command in main.commands.items():
        assert f"## `mtbench {name}`" in text
        for param in command.params:
            for option in getattr(param, "opts", []):
                if option.startswith("--") and option not in ("--debug", "--config"):
                    assert f"`{option}" in text, f"{name} {option}"
