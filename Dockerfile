# The picrl image the compose file runs: the package and its pinned dependencies, nothing else.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY picrl ./picrl
COPY picrl_core ./picrl_core
COPY stream ./stream
COPY producers ./producers
RUN pip install --no-cache-dir .
ENV PYTHONUNBUFFERED=1
ENTRYPOINT ["picrl"]
