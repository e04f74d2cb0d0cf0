# The engine-build image run by the build Job: NVIDIA's TensorRT (Python module, CUDA libraries, trtexec) plus
# `tailtune[builder]`; never kopf or the Kubernetes client.
# No Docker engine runs where this was written, so it was checked by reading only: build it in CI before relying on
# it (`docker build -f engine-builder.Dockerfile -t ghcr.io/tailtune/engine-builder:0.1.0-trt25.01 .`).
FROM nvcr.io/nvidia/tensorrt:25.01-py3

# The base is Ubuntu 24.04, whose system Python refuses pip installs (PEP 668) unless told otherwise; this image
# is single-purpose, so installing into it is what we want.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1

WORKDIR /src
COPY pyproject.toml README.md ./
# Only the product: devkit/ (the development harness) stays out of the image.
COPY tailtune ./tailtune
# The Job runs `python -m tailtune.engine_builder build ...`: make sure `python` exists, not only `python3`.
RUN pip install ".[builder]" \
    && cd / && rm -rf /src \
    && (command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python) \
    && python -c "import tailtune.engine_builder"

# uid 1000 is the base image's `ubuntu` user; the Job's securityContext asks for the same uid.
USER 1000:1000
WORKDIR /tmp
ENTRYPOINT ["python", "-m", "tailtune.engine_builder"]
