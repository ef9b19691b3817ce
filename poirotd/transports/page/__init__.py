"""The operator's page, served by the daemon (`server.PageHttp`); docs/page.md tells its use."""
