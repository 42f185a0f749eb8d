"""Dashboard size and time to interactive in headless Chromium, for a 1000-frame run.

    python benchmarks/dashboard_load.py                 # CarRacing-sized and Udacity-sized frames
    python benchmarks/dashboard_load.py --steps 300 --sizes 96x96

For each frame size: record a synthetic run (real NAC traces from the policy's default
NAC: d_model 64, 4 heads, top-8, window 16; Grad-CAM overlays of a small CNN), build
the dashboard, and open it ``--repeats`` times in headless Chromium (Debian's
``chromium`` through playwright). Time to interactive = ``performance.now()`` when the
page script has drawn the first screen's panels and the first frame, with the scrubber
live (from navigation start); the other panels are drawn right after, without blocking
it ("all panels drawn"). Also times scrubbing: the mean time for one ``setFrame`` to be
drawn, over 50 frames. Goals: <= 25 MB and < 3 s to interactive.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import support_path  # noqa: F401  (tests/support: the browser and synthetic runs)


def measure(html: Path, repeats: int) -> tuple[list[float], list[float], float]:
    """-> (seconds to interactive, seconds until every panel is drawn, ms per scrubbed frame)."""
    from browser import dashboard_page

    ready, all_drawn = [], []
    scrub_ms = float("nan")
    for r in range(repeats):
        with dashboard_page(html) as (page, problems):
            ready.append(page.evaluate("window.__dashboardReadyAt") / 1000.0)
            all_drawn.append(page.evaluate("window.__dashboardAllDrawnAt") / 1000.0)
            if r == 0:
                scrub_ms = page.evaluate("""async () => {
                    const t0 = performance.now();
                    for (let i = 1; i <= 50; i++) {
                        window.dashboard.setFrame(i * 7);
                        await new Promise((ok) => requestAnimationFrame(() => requestAnimationFrame(ok)));
                    }
                    return (performance.now() - t0) / 50; }""")
            if problems:
                raise RuntimeError(f"console errors in {html}: {problems}")
    return ready, all_drawn, scrub_ms


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--sizes", nargs="+", default=["96x96", "160x320"], help="frame HxW to test")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="keep the runs and pages in this directory")
    args = parser.parse_args()

    import torch

    from browser import find_chromium
    from nac_drive.interpret.dashboard import build_dashboard
    from synthetic_runs import make_synthetic_run

    torch.set_num_threads(1)
    if find_chromium() is None:
        raise SystemExit("no Chromium found: apt-get install chromium")
    root = args.keep or Path(tempfile.mkdtemp(prefix="dashboard-bench-"))
    rows = []
    for spec in args.sizes:
        h, w = (int(v) for v in spec.split("x"))
        run_dir = root / f"run-{h}x{w}"
        t0 = time.perf_counter()
        make_synthetic_run(run_dir, steps=args.steps, seed=0, frame_size=(h, w), d_model=64, num_heads=4, topk=8,
                           window=16, input_dim=64, progress=True)
        record_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        html = build_dashboard(run_dir, run_dir / "dashboard.html")
        build_s = time.perf_counter() - t0
        ready, all_drawn, scrub_ms = measure(html, args.repeats)
        rows.append((spec, html.stat().st_size / 1e6, sum(p.stat().st_size for p in (run_dir / "trace").iterdir()) / 1e6,
                     record_s, build_s, statistics.median(ready), max(ready), statistics.median(all_drawn),
                     scrub_ms))

    print(f"\nDashboard of a {args.steps}-frame synthetic run (NAC d_model 64, 4 heads, top-8, window 16; "
          f"saliency overlays), headless Chromium, median of {args.repeats} loads\n")
    print("| frames | dashboard MB | trace MB | record + saliency s | build s | "
          "time to interactive s (median / max) | all panels drawn s | scrub ms/frame |")
    print("|---|---|---|---|---|---|---|---|")
    for spec, mb, trace_mb, rec_s, build_s, med, worst, everything, scrub in rows:
        print(f"| {spec} | {mb:.1f} | {trace_mb:.1f} | {rec_s:.1f} | {build_s:.1f} | {med:.2f} / {worst:.2f} | "
              f"{everything:.2f} | {scrub:.1f} |")
    print(f"\nload average during the run: {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)")
    print(f"\nruns and pages in {root}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
