"""The bridge with a policy given as ``module:callable`` (the test policies of this folder),
for the tests and benchmarks; users run ``nac-drive drive udacity`` / ``nac-drive collect udacity``.

    python tests/support/bridge_main.py --policy udacity_test_policies:Constant03 --port 4567 --json
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from nac_drive.simulators.udacity_session import drive_udacity, record_udacity


def load_policy_factory(spec: str):
    """``"package.module:callable"`` -> the object ``callable()`` returns."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise SystemExit(f"--policy must look like package.module:callable, got {spec!r}")
    return getattr(importlib.import_module(module), name)()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", help="module:callable returning a policy; omit to record manual driving")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=4567)
    p.add_argument("--speed", type=float, default=9.0, help="set speed (mph)")
    p.add_argument("--record", metavar="DIR")
    p.add_argument("--json", action="store_true")
    p.add_argument("--exit-on-disconnect", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.policy is None:
        if not args.record:
            p.error("without --policy, --record DIR is required")
        return record_udacity(args.record, args.host, args.port, args.json, args.exit_on_disconnect)
    return drive_udacity(load_policy_factory(args.policy), args.host, args.port, args.speed, args.record,
                         args.json, args.exit_on_disconnect)


if __name__ == "__main__":
    sys.exit(main())
