#!/usr/bin/env python3
"""The plots of bench/RESULTS.md that come from JSON results (needs matplotlib):

* ``--graph graph_bench.json`` (``kpack_graph_bench --json``) -> ``graph_steps.png``: host
  µs per kernel of a step sent eagerly and as a StepGraph replay, and the step's GPU µs,
  for the 32- and 64-kernel steps;
* ``--python results.json`` (``bench/python_launch_bench.py``) -> ``python_launch_cost.png``:
  host µs per launch of every Python path (median, min-max), 4 and 14 arguments.

    python3 bench/plot_results.py --graph graph_bench.json --python python_bench/results.json \\
        --out bench

The launch-cost plot of the C++ paths (``launch_cost.png``) comes from
``bench/triton_launch_bench.py``.
"""

import argparse
import json
import statistics
import sys
from pathlib import Path


def plot_graph(results, out_png: Path) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    runs = results["runs"]
    labels = [f"{r['kernels']}-kernel step" for r in runs]
    fig, (host, gpu) = plt.subplots(1, 2, figsize=(10, 4))
    x = range(len(runs))
    width = 0.38
    eager = [r["host_us_per_kernel"]["eager_send"] for r in runs]
    graph = [r["host_us_per_kernel"]["graph_send"] for r in runs]
    host.bar([i - width / 2 for i in x], eager, width, label="eager (BoundLaunch::Launch)")
    host.bar([i + width / 2 for i in x], graph, width, label="StepGraph::Replay")
    for i, (e, g) in enumerate(zip(eager, graph)):
        host.text(i - width / 2, e, f"{e:.2f}", ha="center", va="bottom", fontsize=8)
        host.text(i + width / 2, g, f"{g:.2f} ({e / g:.1f}x)", ha="center", va="bottom",
                  fontsize=8)
    host.axhline(0.5, color="gray", linestyle="--", linewidth=0.8, label="target 0.5 µs")
    host.set_xticks(list(x), labels)
    host.set_ylabel("host µs per kernel (sending the step)")
    host.legend(fontsize=8)
    gpu_eager = [r["gpu_us_per_step"]["eager"] for r in runs]
    gpu_graph = [r["gpu_us_per_step"]["graph"] for r in runs]
    gpu.bar([i - width / 2 for i in x], gpu_eager, width, label="eager")
    gpu.bar([i + width / 2 for i in x], gpu_graph, width, label="graph replay")
    for i, (e, g) in enumerate(zip(gpu_eager, gpu_graph)):
        gpu.text(i + width / 2, g, f"{g / e:.3f}x", ha="center", va="bottom", fontsize=8)
    gpu.set_xticks(list(x), labels)
    gpu.set_ylabel("GPU µs per step")
    gpu.legend(fontsize=8)
    fig.suptitle(f"CUDA graphs with sizes changing every step ({results['device']}, "
                 f"{results['steps']} steps per mode)")
    fig.tight_layout()
    fig.savefig(out_png, dpi=150)
    plt.close(fig)


def plot_python(results, labels, out_png: Path, device: str = "") -> None:
    """``device`` titles the plot; by default the one ``results`` names (results.json files
    written before the benchmark recorded it name none)."""
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    per_path = results["us_per_launch"]
    paths = [p for p in per_path if all(per_path[p].get(k) for k in ("args4", "args14"))]
    fig, ax = plt.subplots(figsize=(10, 0.55 * len(paths) + 1.5))
    height = 0.38
    for j, kernel in enumerate(("args4", "args14")):
        medians = [statistics.median(per_path[p][kernel]) for p in paths]
        lows = [m - min(per_path[p][kernel]) for p, m in zip(paths, medians)]
        highs = [max(per_path[p][kernel]) - m for p, m in zip(paths, medians)]
        ys = [i + (j - 0.5) * height for i in range(len(paths))]
        ax.barh(ys, medians, height, xerr=[lows, highs], capsize=2,
                label=f"{kernel[4:]} arguments")
        for y, m, h in zip(ys, medians, highs):
            ax.text(m + h, y, f"  {m:.2f}", va="center", fontsize=7)
    ax.set_yticks(range(len(paths)), [labels.get(p, p) for p in paths], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("host µs per launch (median, min-max over repetitions)")
    ax.legend(fontsize=8)
    device = device or results.get("device", "")
    ax.set_title("Launch cost from Python (torch tensors)" + (f"\n{device}" if device else ""))
    fig.tight_layout()
    fig.savefig(out_png, dpi=150)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", type=Path, help="kpack_graph_bench --json output")
    p.add_argument("--python", type=Path, help="python_launch_bench.py results.json")
    p.add_argument("--python-device", default="",
                   help="the machine, for the Python plot's title, in place of the one "
                   "results.json names (files written before session 32 name none)")
    p.add_argument("--out", type=Path, default=Path("."))
    args = p.parse_args(argv)
    if not args.graph and not args.python:
        p.error("give --graph and/or --python")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.graph:
        plot_graph(json.loads(args.graph.read_text()), args.out / "graph_steps.png")
        print(f"wrote {args.out / 'graph_steps.png'}")
    if args.python:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import python_launch_bench as plb  # noqa: PLC0415 (its row labels)
        labels = {lp.key: lp.label.replace("`", "")
                  for lp in plb.PATHS + plb.EXTRA_PATHS + [plb.RAW]}
        plot_python(json.loads(args.python.read_text()), labels,
                    args.out / "python_launch_cost.png", args.python_device)
        print(f"wrote {args.out / 'python_launch_cost.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
