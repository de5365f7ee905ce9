"""Monte-Carlo simulation of relaxed speculative decoding (imports ``theory``)."""
