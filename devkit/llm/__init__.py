"""EMULATED generative serving (no GPU): an inflight-batching LLM engine inside the real tritonserver, and a
streaming client that measures what users feel (TTFT, TPOT)."""
