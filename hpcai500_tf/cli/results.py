"""`score`, `rank`, `compare` and `scaling`: what result records say, recomputed from them."""

from __future__ import annotations

import argparse
import json

from hpcai500_tf.errors import UserError


def load_records(paths: list[str]) -> list[tuple[str, dict]]:
    from hpcai500_tf import record

    return [(path, record.load(path)) for path in paths]


def _score(args: argparse.Namespace) -> int:
    from hpcai500_tf import config
    from hpcai500_tf.report import throughput_view
    from hpcai500_tf.results import scoring

    args.records = throughput_view.score_apart(args)  # throughput records: their own tables
    if not args.records:
        return 0
    results = []
    for path, rec in load_records(args.records):
        try:
            benchmark = config.load_benchmark(rec["benchmark"])
            results.append((path, rec, scoring.score(rec, benchmark, args.cap, args.convention)))
        except UserError as error:  # which of the records named cannot be scored
            raise UserError(f"{path}: {error}") from None
    if args.json:
        from dataclasses import asdict

        print(json.dumps([{"record": p, **asdict(s)} for p, _, s in results], indent=2))
        return 0
    from hpcai500_tf.report.console import console, escape, score_table

    for path, rec, score in results:
        console.print(score_table(path, rec, score))
    warning = scoring.mixed_bases([score for *_, score in results])
    if warning:
        console.print(f"Warning: {escape(warning)}", style="yellow")
    return 0


def _rank(args: argparse.Namespace) -> int:
    from hpcai500_tf.report import throughput_view
    from hpcai500_tf.results import scoring

    args.records = throughput_view.rank_apart(args)  # throughput records: ranked apart
    if not args.records:
        return 0
    rankings = scoring.rank_records(
        load_records(args.records),
        args.benchmark,
        args.level,
        args.cap,
        args.convention,
        args.max_cv,
        args.published,
    )
    if args.json:
        rendered = [scoring.ranking_to_json(r) for r in rankings]
        print(json.dumps(rendered[0] if len(rendered) == 1 else rendered, indent=2))
        return 0
    from hpcai500_tf.report.console import console, ranking_table, refused_table

    for ranking in rankings:
        console.print(ranking_table(ranking))
    if rankings[-1].refused:
        console.print(refused_table(rankings[-1].refused))
    return 0


def _scaling(args: argparse.Namespace) -> int:
    from hpcai500_tf.files import check_output_directory
    from hpcai500_tf.results import scaling

    series = scaling.analyse(load_records(args.records))
    out = check_output_directory("--out", args.out)
    taken = [p for p in (out / "scaling.png", out / "scaling.svg") if p.exists()]
    if taken:
        raise UserError(f"{taken[0]}: already exists; choose another --out")
    images = scaling.chart(series, out)
    if args.json:
        print(json.dumps(scaling.to_json(series), indent=2))
        return 0
    from hpcai500_tf.report.console import console, scaling_table

    for one in series:
        console.print(scaling_table(one))
    console.print(f"chart: {', '.join(map(str, images))}", markup=False)
    return 0


def _compare(args: argparse.Namespace) -> int:
    from hpcai500_tf import config
    from hpcai500_tf.results import compare

    (path_a, a), (path_b, b) = load_records([args.a, args.b])
    for rec in (a, b):
        config.load_benchmark(rec["benchmark"])  # an unknown benchmark is refused
    comparison = compare.compare(a, b, cap=args.cap)
    if args.json:
        print(json.dumps(compare.to_json(comparison, path_a, path_b), indent=2))
        return 0
    from hpcai500_tf.report.console import comparison_tables, console

    for table in comparison_tables(comparison, path_a, path_b):
        console.print(table)
    return 0


def _compare_arguments(compare: argparse.ArgumentParser) -> None:
    compare.add_argument("a", metavar="A", help="the baseline record")
    compare.add_argument("b", metavar="B", help="the record compared with it")
    compare.add_argument("--cap", action="store_true", help="cap the quality factor at 1")
    compare.add_argument("--json", action="store_true")
    compare.set_defaults(handler=_compare)


def _scaling_arguments(scaling: argparse.ArgumentParser) -> None:
    scaling.add_argument("records", nargs="+", metavar="RECORD")
    scaling.add_argument("--out", default="runs/scaling", help="where the chart goes")
    scaling.add_argument("--json", action="store_true")
    scaling.set_defaults(handler=_scaling)


def _score_arguments(score: argparse.ArgumentParser) -> None:
    score.add_argument("records", nargs="+", metavar="RECORD")
    score.add_argument(
        "--cap",
        action="store_true",
        help="cap the quality factor at 1 (off by default, as published)",
    )
    score.add_argument(
        "--convention",
        default="stated",
        help="scoring convention from the benchmark config (default: stated)",
    )
    score.add_argument("--json", action="store_true")
    score.set_defaults(handler=_score)


def _rank_arguments(rank: argparse.ArgumentParser) -> None:
    rank.add_argument("records", nargs="+", metavar="RECORD")
    rank.add_argument("--level", default="free", help="free, system or hardware (default free)")
    rank.add_argument("--benchmark", help="rank this benchmark; other records are refused")
    rank.add_argument("--cap", action="store_true", help="cap the quality factor at 1")
    rank.add_argument(
        "--max-cv", type=float, help="flag submissions whose run-to-run variation exceeds this"
    )
    rank.add_argument(
        "--convention",
        default="stated",
        help="scoring convention from the benchmark config (default: stated, the rule as "
        "published; published-2020: what the July 2020 ranking's figures imply, the records "
        "placed among its nine entries)",
    )
    rank.add_argument(
        "--published",
        action="store_true",
        help="place the records among the nine entries of the July 2020 image-classification "
        "ranking (examples/published_2020/), scored by the stated rule and by the ranking's own "
        "conventions",
    )
    rank.add_argument("--json", action="store_true")
    rank.set_defaults(handler=_rank)


PARSERS = {
    "compare": _compare_arguments,
    "scaling": _scaling_arguments,
    "score": _score_arguments,
    "rank": _rank_arguments,
}
