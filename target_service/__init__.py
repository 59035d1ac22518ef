"""The target side: the large model whose output speculation must reproduce exactly."""
