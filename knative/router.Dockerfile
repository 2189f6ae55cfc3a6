# The grove router image for a cluster (the Knative backend). Build from the repository root:
#   docker build -f knative/router.Dockerfile -t ghcr.io/<you>/grove-router:0.1.0 .
FROM python:3.11-slim-bookworm
WORKDIR /src
COPY pyproject.toml README.md ./
COPY grove grove
COPY executor executor
COPY router router
COPY artifacts artifacts
COPY sandbox_image sandbox_image
RUN pip install --no-cache-dir . && useradd --uid 1000 --create-home grove
USER 1000
ENTRYPOINT ["grove"]
CMD ["--help"]
