"""Live decode on the lent GPU, driven as a user drives it (Streamlit AppTest): a 30 s clip decoded by the command line
and by the page must give the same tokens, with the seconds from pressing Run to the page's first view; then two
sessions press Run at once through the server's one pipeline, and each must get the tokens it gets alone.

    python tools/gpu_dashboard.py CLIP --draft whisper-tiny.en/anchordraft --out dashboard.json [--device cuda]
"""

import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def session(clip: Path, args: argparse.Namespace) -> AppTest:
    """A fresh browser session on Live decode with the clip uploaded and the sidebar set."""
    app = AppTest.from_file(APP, default_timeout=600).run()
    app.sidebar.selectbox(key="target").set_value(args.target)
    app.sidebar.selectbox(key="device").set_value(args.device)
    app.sidebar.selectbox(key="dtype").set_value(args.dtype)
    app.sidebar.selectbox(key="draft").set_value(args.draft)
    app.sidebar.slider(key="k").set_value(args.k)
    app.radio(key="decode_source").set_value("upload").run()
    app.get("file_uploader")[0].upload(clip.name, clip.read_bytes()).run()
    return app


def press_run(app: AppTest) -> dict:
    """Run, timed to the page's first view of the result."""
    start = time.perf_counter()
    app.button(key="run").click().run()
    seconds = time.perf_counter() - start
    problems = [e.value for e in app.exception] + [e.value for e in app.error]
    trace = app.session_state["decoded"]["trace"] if not problems else None
    return {
        "seconds_to_view": seconds,
        "problems": problems,
        "tokens": trace and trace.tokens,
        "device": trace and trace.settings.device,
        "rounds": trace and len(trace.rounds),
    }


def command_line_tokens(clip: Path, args: argparse.Namespace) -> list[int]:
    command = [sys.executable, "-m", "specasr", "decode", str(clip), "--target", args.target, "--device", args.device]
    command += ["--dtype", args.dtype, "--draft", args.draft, "--k", str(args.k), "--no-store", "--json"]
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)["tokens"]


def at_once(apps: list[AppTest]) -> list[dict]:
    """Every session presses Run at the same moment, each from its own thread (as Streamlit serves sessions)."""
    results, start = [None] * len(apps), threading.Barrier(len(apps))

    def run(i: int) -> None:
        start.wait()
        results[i] = press_run(apps[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(apps))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("clip", type=Path)
    parser.add_argument("--target", default="whisper-tiny.en")
    parser.add_argument("--draft", default="whisper-tiny.en/anchordraft")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    expected = command_line_tokens(args.clip, args)
    first = session(args.clip, args)
    cold = press_run(first)  # loads the target, draft and aligner and captures the steps: once per server
    warm = press_run(first)
    together = at_once([session(args.clip, args), session(args.clip, args)])
    report = {
        "settings": vars(args) | {"clip": str(args.clip), "out": str(args.out)},
        "cold": cold,
        "warm": warm,
        "together": together,
        "same_tokens_as_command_line": [r["tokens"] == expected for r in (cold, warm, *together)],
    }
    args.out.write_text(json.dumps(report, indent=1))
    for name, result in (("cold", cold), ("warm", warm), ("session 1", together[0]), ("session 2", together[1])):
        same = result["tokens"] == expected
        print(f"{name}: {result['seconds_to_view']:.2f} s to view on {result['device']}, tokens as the CLI's: {same}")
        for problem in result["problems"]:
            print(f"  {problem}")


if __name__ == "__main__":
    main()
