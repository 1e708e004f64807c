"""The `longca` command itself: its version and its help read as text."""

import subprocess

import longca


def test_version_and_help_read_as_plain_text():
    version = subprocess.run(["longca", "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == f"longca {longca.__version__}"
    help_ = subprocess.run(["longca", "--help"], capture_output=True, text=True, timeout=60)
    assert help_.returncode == 0 and "run-cell" in help_.stdout
    assert "``" not in help_.stdout  # no reStructuredText markup on a terminal


def test_every_subcommand_says_what_it_does_and_every_flag_has_help():
    from longca.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    bare = []
    for name, command in sub.choices.items():
        if not command.description:
            bare.append(f"{name}: no description")
        bare += [f"{name} {a.option_strings or a.dest}: no help" for a in command._actions
                 if a.dest != "help" and not a.help]
    assert not bare, "\n".join(bare)
    text = subprocess.run(["longca", "predict", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "(default: causal)" in text and "(default: [8, 16, 32, 64, 96])" in text
