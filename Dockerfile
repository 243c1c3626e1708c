# CPU image of sparkgate with the embedded default model (no GPU, no downloads at run time).
# The DGX Spark's GPU image is deploy/Dockerfile.gpu (NVIDIA's vLLM container as its base).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends make gcc g++ libnuma1 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY . .
RUN make setup models
ENV SPARKGATE_SERVER__HOST=0.0.0.0
EXPOSE 8000
# Exec form: SIGTERM reaches sparkgate itself (not a shell), which drains before it exits;
# give it longer than server.drain_grace_s to do so (compose's stop_grace_period: 45s).
STOPSIGNAL SIGTERM
CMD [".venv/bin/sparkgate", "serve", "--config", "config/default.yaml"]
