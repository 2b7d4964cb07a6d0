"""Step one of compat's flow: what the device and the installed software are.

`profile` (the `DeviceProfile` and `SoftwareInfo` records), `catalog` (known devices, for simulation),
`detect` (reads the real device and software, or stands in for a catalog device), `support` (what the
installed libraries support, from their own support tables) and `engines` (the rollout engines this
verl builds). Nothing here decides anything; `verl.compat.planning` does.
"""
