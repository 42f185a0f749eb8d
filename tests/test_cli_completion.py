"""``nac-drive completion bash|zsh`` (issue 56 item 3): a completion script that names every
verb and its flags, and that bash runs."""

import shutil
import subprocess

import pytest

from nac_drive.cli.main import COMMANDS, main


def script(shell, capsys) -> str:
    assert main(["completion", shell]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_the_script_names_every_verb_and_some_flags(shell, capsys):
    text = script(shell, capsys)
    for verb in COMMANDS:
        assert verb in text, (shell, verb)
    for word in ("udacity-emulator", "kickstart", "--windows-per-epoch", "--config", "--closed-loop-tracks",
                 "--perturb", "--json"):
        assert word in text, (shell, word)


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_a_verb_and_a_flag_with_it(tmp_path, capsys):
    path = tmp_path / "nac-drive.bash"
    path.write_text(script("bash", capsys))

    def complete(*words) -> list[str]:
        line = " ".join(["nac-drive", *words])
        shown = subprocess.run(["bash", "-c", f'source {path}; COMP_WORDS=({line}); COMP_CWORD={len(words)}; '
                                              'COMP_LINE="$*"; _shtab_nac_drive; printf "%s\\n" "${COMPREPLY[@]}"'],
                               capture_output=True, text=True, timeout=60)
        assert shown.returncode == 0, shown.stderr
        return shown.stdout.split()

    assert complete("tr") == ["train"]
    assert complete("dagger", "--ora") == ["--oracle"]
    assert "carracing" in complete("drive", "")


def test_an_unknown_shell_is_refused_in_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["completion", "fish"])
    assert stop.value.code == 2 and "invalid choice: 'fish'" in capsys.readouterr().err
