"""Views of the store for other libraries: a zarr v3 store over the CAS and a read-only
fsspec filesystem over trees."""
