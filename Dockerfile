# The dashboard on a GPU host: docker build -t specasr . && docker run --gpus all -p 8501:8501 specasr
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive PYTHONUNBUFFERED=1
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv libsndfile1 \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY requirements.txt .
# From PyPI, torch==2.13.0 is the CUDA build.
RUN python3.11 -m venv /venv && /venv/bin/pip install --no-cache-dir -r requirements.txt
COPY . .
# Convert the bundled Whisper weights at build time so the first request does not wait.
RUN /venv/bin/python -c "from specasr.targets import load_target as t; t('whisper-tiny.en'); t('whisper-base')"

EXPOSE 8501
CMD ["/venv/bin/streamlit", "run", "app.py", "--server.address=0.0.0.0", "--server.port=8501"]
