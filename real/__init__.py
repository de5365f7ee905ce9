"""Speculative decoding for real AR image models (torch; imports ``theory`` and ``sim``)."""
