"""Drop-in adapters that let serving runners use pcp_fn's ops (``import pcp_fn`` never imports them)."""
