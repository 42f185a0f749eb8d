"""``nac-drive dashboard RUN_DIR -o dashboard.html``: one offline HTML file for a recorded run;
``--rrd run.rrd``: the same run as a Rerun recording (what ``drive --rerun`` shows live)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from nac_drive.fields import REQUIRED, arg, check_fields

HTML = "the HTML file (written without --rrd, or with -o)"


@dataclass
class DashboardArgs:
    """Arguments of ``nac-drive dashboard``."""

    run_dir: str = arg(REQUIRED, "directory holding a trace (written by drive --trace)", positional=True,
                       metavar="RUN_DIR")
    output: str | None = arg(None, "output file (default: RUN_DIR/dashboard.html)", metavar="HTML", short="-o")
    rrd: str | None = arg(None, "write the run as a Rerun recording (the layout drive --rerun streams live; needs the "
                                "'live' extra) instead of the HTML file, or as well with -o", metavar="FILE.rrd")
    video: str | None = arg(None, "the run's video (drive --video), played beside the traces (default: "
                                  "RUN_DIR/video.webm if present)", metavar="WEBM", group=HTML)
    title: str | None = arg(None, "page title (default: the run directory's name)", group=HTML)
    image_budget_mb: float = arg(12.0, "frame + overlay videos above this many MB (base64) are encoded coarser, then "
                                       "smaller", above=0, group=HTML)

    def __post_init__(self):
        check_fields(self)

    def ignored(self) -> dict[str, str]:
        """With --rrd alone no HTML file is written: its options."""
        if self.rrd is None or self.output is not None:
            return {}
        return {f.name: "only for the HTML file (--rrd alone writes none; add -o HTML for both)"
                for f in fields(self) if f.metadata["group"] == HTML}


def add_parser(subparsers) -> None:
    from nac_drive.cli.arguments import JsonOutput, add_dataclass_arguments

    p = subparsers.add_parser(
        "dashboard", help="write a self-contained HTML dashboard of a recorded run",
        description="Read the trace RUN_DIR/trace/ (and RUN_DIR/saliency.npz, window_attribution.npz and explain.json "
                    "if present) and write one HTML file that works offline: an episode selector with each "
                    "episode's return, lap and policy/expert agreement, frame scrubber, saliency overlay, the run's "
                    "video, actions, running return, cross-track error, neuron heatmaps, which past frame each "
                    "decision used, NCP wiring.")
    for cls in (DashboardArgs, JsonOutput):
        add_dataclass_arguments(p, cls)
    p.set_defaults(func=run)


def run(namespace: argparse.Namespace) -> int:
    import os

    from nac_drive.cli.arguments import JsonOutput, from_namespace
    from nac_drive.interpret.dashboard import build_dashboard

    args, output = from_namespace(DashboardArgs, namespace), from_namespace(JsonOutput, namespace)
    paths = []
    if args.rrd is not None:
        paths.append(write_rrd(args.run_dir, args.rrd))
    if args.rrd is None or args.output is not None:
        paths.append(build_dashboard(args.run_dir, args.output, image_budget=int(args.image_budget_mb * 1e6),
                                     title=args.title, video=args.video))
    written = [{"path": str(path), "mb": os.path.getsize(path) / 1e6} for path in paths]
    for file in written:
        print(f"wrote {file['path']} ({file['mb']:.1f} MB)")
    output.emit({"written": written})
    return 0


def write_rrd(run_dir, out) -> str:
    """The recorded run (and its saliency.npz, if it holds one of this trace) as a Rerun recording."""
    from nac_drive.interpret.live_view import check_rrd_path, require_rerun, trace_to_rrd
    from nac_drive.interpret.saliency import SALIENCY_FILE, load_saliency
    from nac_drive.interpret.trace import load_trace

    require_rerun()
    check_rrd_path(out, "--rrd")
    run = load_trace(run_dir)
    saliency_file = run.path.parent / SALIENCY_FILE
    saliency = load_saliency(saliency_file, trace=run) if saliency_file.is_file() else None
    return str(trace_to_rrd(run, out, saliency=saliency))
