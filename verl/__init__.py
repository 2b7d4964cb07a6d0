"""verl, hardware-adaptive: upstream verl's API with every hardware decision made by `verl.compat`."""

__version__ = "0.9.1.post1"
