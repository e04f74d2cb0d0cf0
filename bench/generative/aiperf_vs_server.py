"""NVIDIA AIPerf against the EMULATED LLM in the real tritonserver, offline: AIPerf's TTFT/TPOT percentiles are the
client truth, the model's histograms (`devkit.llm.metrics`) the server's figures, on the same run.

AIPerf lives in its own venv (heavy dependencies): `python3.11 -m venv /tmp/aiperf-venv &&
/tmp/aiperf-venv/bin/pip install aiperf` (0.13.0 was used). What it takes to run it with no network:
- a tokenizer on disk: its `--tokenizer builtin` is not network-free (tiktoken downloads o200k_base on first
  use), and with HF_HUB_OFFLINE=1 it looks a local path up as a Hub repo id in the HF cache and fails; so this
  script saves a whitespace word-level tokenizer (the `tokenizers` library, in AIPerf's venv) and passes its
  folder with the offline variables unset (a local folder then loads without the Hub);
- an endpoint it speaks: AIPerf talks HTTP (OpenAI-style, or a Jinja template), so it reaches the model through
  Triton's `POST /v2/models/<m>/generate_stream` (server-sent events), with a template that turns the prompt's
  words into `input_ids` and `max_tokens` into `request_output_len`, and a JMESPath that makes each event's token
  one word (AIPerf counts output tokens by tokenizing the streamed text).
AIPerf's `inter_token_latency` is per request (latency - TTFT) / (output tokens - 1): the same TPOT the model's
histogram holds. Percentiles of the server come from the cumulative buckets with Prometheus' interpolation.

Run: .venv/bin/python bench/generative/aiperf_vs_server.py [--aiperf /tmp/aiperf-venv/bin/aiperf] [--rate 8]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from devkit.llm import metrics as names  # noqa: E402
from devkit.llm.repository import EmulatedLlm, write_llm_repository  # noqa: E402
from devkit.triton.local import start_tritonserver  # noqa: E402

TOKENIZER_SCRIPT = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
tok = Tokenizer(models.WordLevel(vocab={"[UNK]": 0, "[PAD]": 1}, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(sys.argv[1])
"""
# One token per word of AIPerf's synthetic prompt (its tokenizer above counts words too).
PAYLOAD_TEMPLATE = (
    '{"input_ids": {{ ([1] * (text.split()|length)) | tojson }}, "request_output_len": [{{ max_tokens or 16 }}]}\n'
)
# Each event's token id as one word: "17 " (a bare 0 would read as no content).
RESPONSE_FIELD = "join('', [to_string(output_ids), ' '])"


def histogram_quantile(text: str, histogram: str, model: str, q: float) -> float:
    """Prometheus' histogram_quantile over one model's cumulative buckets in a /metrics page."""
    buckets: list[tuple[float, float]] = []
    for line in text.splitlines():
        if line.startswith(f"{histogram}_bucket{{") and f'model="{model}"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((math.inf if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            return lower if math.isinf(le) else lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    return math.nan


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--aiperf", default="/tmp/aiperf-venv/bin/aiperf")
    parser.add_argument("--rate", type=float, default=8.0, help="requests per second (Poisson)")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--roofline", default="l4")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="aiperf-vs-server-"))
    python = Path(args.aiperf).parent / "python"
    subprocess.run([str(python), "-c", TOKENIZER_SCRIPT, str(work / "tokenizer")], check=True, capture_output=True)
    (work / "payload.jinja").write_text(PAYLOAD_TEMPLATE)
    repo = work / "repo"
    write_llm_repository(repo, "llm", EmulatedLlm(roofline=args.roofline))
    server = start_tritonserver(repo, load_models=["llm"], exit_timeout_secs=2)
    try:
        cmd = [
            args.aiperf, "profile", "-m", "llm", "--tokenizer", str(work / "tokenizer"), "--url", server.http_url,
            "--endpoint-type", "template", "--custom-endpoint", "/v2/models/llm/generate_stream", "--streaming",
            "--extra-inputs", f"payload_template:{work / 'payload.jinja'}",
            "--extra-inputs", json.dumps({"response_field": RESPONSE_FIELD}),
            "--synthetic-input-tokens-mean", "384", "--synthetic-input-tokens-stddev", "150",
            "--output-tokens-mean", "12", "--output-tokens-stddev", "4",
            "--request-rate", str(args.rate), "--request-count", str(args.requests), "--random-seed", "39",
            "--artifact-dir", str(work / "aiperf"), "--ui-type", "none",
        ]  # fmt: skip
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if run.returncode != 0:
            print(run.stdout[-4000:], run.stderr[-4000:], file=sys.stderr)
            return 1
        client = json.loads((work / "aiperf" / "profile_export_aiperf.json").read_text())
        with urllib.request.urlopen(server.metrics_url, timeout=5) as r:
            text = r.read().decode()
    finally:
        server.stop()
    print(f"AIPerf {client['request_count']['avg']:.0f} requests at {args.rate:g}/s on {args.roofline}; work in {work}")
    worst = 0.0
    for label, metric, histogram in (
        ("TTFT", "time_to_first_token", names.TTFT_HISTOGRAM_MS),
        ("TPOT", "inter_token_latency", names.TPOT_HISTOGRAM_MS),
    ):
        for p in (50, 90, 99):
            truth = float(client[metric][f"p{p}"])
            server_ms = histogram_quantile(text, histogram, "llm", p / 100)
            error = server_ms / truth - 1
            worst = max(worst, abs(error)) if p != 99 else worst
            print(f"{label} P{p}: AIPerf {truth:.1f} ms, server {server_ms:.1f} ms, server/AIPerf - 1 = {error:+.1%}")
    print(f"worst P50/P90 error {worst:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
