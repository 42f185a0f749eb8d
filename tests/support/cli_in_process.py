"""The CLI's ``main`` run in the test's process: a verb's exit code, as its command line would end.

Argument checks refuse before any work, so the many refusals of a table of cases need no process
each (a process costs its imports: 0.4-4.6 s a case); what only a real process shows (the
console script, signals, a library printing at import) is tested with one elsewhere.
"""

from __future__ import annotations


def exit_code(argv: list[str]) -> int:
    """``nac-drive ARGV``'s exit status: ``main``'s return value, or argparse's (SystemExit). What a
    verb sets for its whole process, as a command line owns it, is put back: torch's threads (the Udacity
    bridge and the expert's training set one for the process)."""
    import torch

    from nac_drive.cli import main

    threads = torch.get_num_threads()
    try:
        return main(list(argv))
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    finally:
        torch.set_num_threads(threads)
