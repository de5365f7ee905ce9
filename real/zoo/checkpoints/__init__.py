"""Shipped weights (``*.safetensors``) and ``manifest.json`` (hashes, commands, measured quality).

A package only so that setuptools ships the files as package data."""
