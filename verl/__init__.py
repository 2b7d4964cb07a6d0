"""verl, hardware-adaptive: upstream verl's API with every hardware decision made by `verl.compat`."""

__version__ = "0.9.1.post1"
__all__ = ["DataProto", "__version__"]


def __getattr__(name: str):
    """`from verl import DataProto` as upstream, loaded on first use: `import verl` (config checks,
    the doctor) must not pay for torch."""
    if name == "DataProto":
        from verl.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'verl' has no attribute {name!r}")
