# The operator image: `tailtune operator` (kopf) and nothing of TensorRT.
# No Docker engine runs where this was written, so it was checked by reading only: build it in CI before relying
# on it (`docker build -t ghcr.io/tailtune/operator:0.1.0 .`).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package build needs, so .venv/, .git/ and caches stay out without a .dockerignore.
WORKDIR /src
COPY pyproject.toml README.md ./
# Only the product: devkit/ (the development harness) stays out of the image.
COPY tailtune ./tailtune
RUN pip install ".[operator]" \
    && cd / && rm -rf /src \
    && useradd --system --uid 10001 --user-group --no-create-home --home-dir /nonexistent tailtune

# Numeric, so the kubelet can check runAsNonRoot without a passwd lookup.
USER 10001:10001
WORKDIR /
# 8080: kopf's liveness endpoint; 9090: the operator's Prometheus metrics.
EXPOSE 8080 9090
ENTRYPOINT ["tailtune", "operator"]
