"""`python -m arlctl.envs.swe [IDS...]`: the harness self-check (gold patch -> 1, empty patch -> 0)."""

from __future__ import annotations

from arlctl.envs.swe.grader import sandbox_factory, self_check


def main(argv: list[str] | None = None) -> int:
    """The harness self-check on a real sandbox backend."""
    import argparse
    import asyncio

    from arlctl.envs.swe.tasks import builtin_swe

    parser = argparse.ArgumentParser(description="gold patch -> 1 and empty patch -> 0 for every task")
    parser.add_argument("ids", nargs="*", help="instance ids (default: the whole built-in suite)")
    parser.add_argument("--sandbox", default="bwrap")
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args(argv)
    tasks = builtin_swe({"ids": ",".join(args.ids)} if args.ids else {})
    rows = asyncio.run(self_check(tasks, sandbox_factory(args.sandbox), args.concurrency))
    for row in rows:
        print(f"{'ok ' if row['ok'] else 'BAD'} {row['task_id']}: gold={row['gold']} empty={row['empty']}"
              + ("" if row["ok"] else f" failed={row['gold_failed']} error={row['error']}"))
    bad = sum(not r["ok"] for r in rows)
    print(f"{len(rows) - bad}/{len(rows)} tasks pass the self-check")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
