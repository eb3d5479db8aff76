"""satchel: context assembly for LLM agents.

`satchel.v1` holds the generated gRPC stubs, `satchel.client` the light SDK,
`satchel.server` the service.
"""

__version__ = "0.1.0"
