"""python -m torch_pjrt: command-line tools."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import List, Optional

from torch_pjrt import PjrtError, _plugins


def _info(device: Optional[str]) -> dict:
    choice = _plugins.find_plugin(device)
    # Before the client starts: reading the versions forks a child.
    try:
        found = _plugins.plugin_candidates(device)
    except (PjrtError, ValueError):
        found = []
    chosen = os.path.realpath(choice.path)
    alternatives = [
        {"path": c["path"], "package": c["package"], "pjrt_api_version": c["pjrt_api_version"], "problem": c["problem"]}
        for c in found if os.path.realpath(c["path"]) != chosen
    ]
    client = _plugins.create_client(device)
    plugin = _C_plugin(choice.path)
    attrs = plugin.attributes
    major, minor = plugin.api_version
    return {
        "plugin": choice.path,
        "device": choice.device,
        "package": next((c["package"] for c in found if os.path.realpath(c["path"]) == chosen), ""),
        "chosen_by": choice.reason,
        "pjrt_api_version": f"{major}.{minor}",
        "platform_name": client.platform_name,
        "platform_version": client.platform_version,
        "xla_version": attrs.get("xla_version", ""),
        # Plugins report StableHLO versions as int lists ("1,13,3").
        "stablehlo_current_version": attrs.get("stablehlo_current_version", "").replace(",", "."),
        "stablehlo_minimum_version": attrs.get("stablehlo_minimum_version", "").replace(",", "."),
        "process_index": client.process_index,
        "devices": [
            {k: d[k] for k in ("id", "kind", "local_hardware_id", "process_index", "addressable")}
            for d in client.devices()
        ],
        # Other installed plugins for the same device, which the rule (newest
        # PJRT API; TORCH_PJRT_PLUGIN picks one explicitly) did not choose.
        "alternatives": alternatives,
    }


def _C_plugin(path: str):
    from torch_pjrt import _C

    return _C.Plugin.load(path)


def _print_info(info: dict) -> None:
    width = max(len(k) for k in info)
    for key, value in info.items():
        if key in ("devices", "alternatives"):
            continue
        print(f"{key:<{width}}  {value}")
    print(f"{'devices':<{width}}  {len(info['devices'])}")
    for d in info["devices"]:
        print(
            f"  id {d['id']:>3}  kind {d['kind']:<12} local_hardware_id {d['local_hardware_id']:>3}"
            f"  process {d['process_index']}"
        )
    alts = info["alternatives"]
    print(f"{'alternatives':<{width}}  {len(alts)}" + ("  (set TORCH_PJRT_PLUGIN to use one)" if alts else ""))
    for a in alts:
        version = f"PJRT API {a['pjrt_api_version']}" if a["pjrt_api_version"] else "PJRT API unknown"
        note = f"  ({a['problem']})" if a["problem"] else ""
        print(f"  {a['package'] or '(unknown package)':<24} {version:<16} {a['path']}{note}")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_pjrt", description="torch-pjrt tools")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser(
        "info",
        help="show the PJRT plugin in use, its versions and devices",
        description="Show which PJRT plugin is chosen (TORCH_PJRT_PLUGIN, else PJRT_DEVICE, else CPU; among "
        "several installed plugins for the device, the newest PJRT API), its PJRT API, XLA and StableHLO "
        "versions, its devices, and the other installed plugins it could have used.",
    )
    info.add_argument("--json", action="store_true", help="print JSON instead of text")
    info.add_argument("--device", default=None, help="device name to look up instead of PJRT_DEVICE (e.g. CPU, CUDA)")
    sub.add_parser("doctor", add_help=False, help="check this environment and say how to fix what is wrong "
                   "(python -m torch_pjrt doctor --help)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["doctor"]:
        from torch_pjrt import doctor

        return doctor.main(argv[1:])
    args = parser.parse_args(argv)

    if args.command == "info":
        try:
            data = _info(args.device)
        except (PjrtError, ValueError) as e:
            print(f"torch_pjrt: {e}", file=sys.stderr)
            return 1
        if args.json:
            print(json.dumps(data, indent=2))
        else:
            _print_info(data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
