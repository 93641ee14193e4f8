# Memci proxy image.
#   docker build -t memci-proxy .
#   docker run -p 8080:8080 -e MEMCI_UPSTREAM_URL=http://host.docker.internal:30000/v1 memci-proxy
# Without DATABASE_URL / REDIS_URL the proxy runs its embedded PostgreSQL and in-process hot state under
# MEMCI_HOME (/data, a volume). compose.yaml wires PostgreSQL, Redis, SGLang, Prometheus and Grafana.

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MEMCI_HOME=/data
RUN useradd --system --uid 10001 --user-group --home-dir /data --no-create-home memci \
 && mkdir -p /data \
 && chown memci:memci /data
WORKDIR /app
COPY . .
# Installed in place (-e): `memci-proxy migrate` finds the Alembic environment (alembic.ini, migrations/)
# and config/default.toml next to the package, as in a checkout.
RUN pip install -e . \
 && python -c "import proxy.cli, proxy.settings"
USER memci
VOLUME ["/data"]
EXPOSE 8080
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import sys, urllib.request; sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:8080/health', timeout=4).status == 200 else 1)"]
ENTRYPOINT ["memci-proxy"]
CMD ["serve", "--host", "0.0.0.0", "--port", "8080"]
