"""The share of saliency on the road ahead, core by core: a markdown table from several
``explain.json`` reports (``nac-drive explain --policy RUN/best``, one per core), each
method's ``saliency.road_share`` with its 95% block-bootstrap interval, then the uniform
map's share (the road's pixel share, the chance level). A proxy for the paper's Fig. 6 claim
(the NAC's saliency keeps to the road up to the horizon, other cores' does not).

    python benchmarks/saliency_road_share.py runs/explain-nac/explain.json runs/explain-gru/explain.json

Each row is labelled by the folder of its report; nothing is driven here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from nac_drive.interpret.explain_report import MAX_REPORT_BYTES
from nac_drive.interpret.road_share import markdown_table, road_share_rows
from nac_drive.io import bounded_json
from nac_drive.io.capped_read import read_capped


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="explain.json files")
    args = parser.parse_args(argv)
    reports = {str(path.parent): bounded_json.loads(read_capped(path, MAX_REPORT_BYTES))
               for path in args.reports}
    print(markdown_table(road_share_rows(reports)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
