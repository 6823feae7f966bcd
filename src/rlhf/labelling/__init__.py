"""`rlhf label`: people label pairs on a web page we serve, or an LLM judge labels them; `--stats` reads the result.

- `pairs` reads what ``rlhf sample`` writes (pairs, or k candidates per prompt) and gives each pair its id;
- `session` keeps the state of a labelling session, every change appended to the labels file first;
- `server` is the web page and its JSON API, with the token, host and size checks;
- `judge` asks an OpenAI-compatible chat-completions server to compare pairs, in both orders, and `listwise` to
  rank a candidates row's k answers at once (``mode: ranking``), as given and reversed;
- `stats` counts labels per labeller and measures position bias and agreement.

The labels file format is `rlhf.data.labels`; ``rlhf rm`` reads it directly. Nothing here loads torch."""

from __future__ import annotations

import json
import os
import secrets
import sys
from typing import Any

from rlhf.config import LabelConfig, llm_judge


def run(config: LabelConfig) -> dict[str, Any]:
    """Print statistics (``stats``), label with an LLM judge (``judge.source``), or serve the labelling page."""
    from rlhf.labelling.pairs import read_items, read_pairs
    from rlhf.labelling.stats import format_stats, label_stats

    if config.stats:
        stats = label_stats(config.stats)
        print(json.dumps(stats, indent=2) if config.json else format_stats(stats))
        return stats
    assert config.pairs is not None and config.out is not None  # checked by LabelConfig
    if llm_judge(config.judge.source) is not None and config.mode == "ranking" and has_candidates(config.pairs):
        from rlhf.labelling.listwise import judge_candidates_file
        from rlhf.labelling.pairs import read_candidates

        return judge_candidates_file(read_candidates(config.pairs), config.out, config.judge)
    if llm_judge(config.judge.source) is not None:
        from rlhf.labelling.judge import judge_pair_file

        return judge_pair_file(read_pairs(config.pairs), config.out, config.judge)
    return serve(config, read_items(config.pairs, mode=config.mode))


def has_candidates(path: str) -> bool:
    """Whether a file holds candidates rows (``completions``) to rank; a pairs file is always labelled in pairs."""
    from rlhf.data.files import read_records

    return any("completions" in record.data for record in read_records(path))


def serve(config: LabelConfig, items: Any) -> dict[str, Any]:
    """Serve the labelling page until Ctrl-C; returns the labelling progress at the end."""
    import uvicorn

    from rlhf.labelling.pairs import Candidates
    from rlhf.labelling.server import bind, is_loopback, make_app
    from rlhf.labelling.session import LabelSession

    loopback = is_loopback(config.host)
    token = config.token or os.environ.get("RLHF_LABEL_TOKEN") or (None if loopback else secrets.token_urlsafe(18))
    session = LabelSession(items, config.out, config.labels_per_pair, config.lease_seconds)
    try:
        sock = bind(config.host, config.port)
        port = sock.getsockname()[1]
        app = make_app(session, token, loopback_only=loopback, ratings=config.ratings)
        host = "127.0.0.1" if config.host in ("0.0.0.0", "::") else config.host
        url = f"http://{f'[{host}]' if ':' in host else host}:{port}/" + (f"?token={token}" if token else "")
        done, total = session.overall()
        rankings = items.count(Candidates)
        print(
            f"label: {len(items.items) - rankings} pairs and {rankings} items to rank (--mode {items.mode}) from "
            f"{items.path} ({items.identical} repeated answers and {items.repeated} repeated items left out), "
            f"{config.labels_per_pair} label(s) each; {done} / {total} done; labels go to {config.out}",
            file=sys.stderr,
        )
        if config.host in ("0.0.0.0", "::"):
            print(
                f"label: listening on every address of this machine, port {port}; other machines use its address "
                "in place of 127.0.0.1",
                file=sys.stderr,
            )
        print(f"label: open {url}  (Ctrl-C stops; a restart continues where everyone was)", file=sys.stderr)
        print(url, flush=True)  # on stdout alone, for scripts
        uvicorn.Server(
            uvicorn.Config(
                app,
                log_level="warning",
                access_log=False,
                lifespan="off",
                timeout_graceful_shutdown=2,
                h11_max_incomplete_event_size=16 * 1024,
            )
        ).run(sockets=[sock])
        done, total = session.overall()
        print(f"label: stopped; {done} / {total} labelled, in {config.out}", file=sys.stderr)
        return {"done": done, "total": total}
    finally:
        session.close()
