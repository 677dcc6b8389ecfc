"""Tools for chip vendors, apart from the user namespace ``oar.*``.

- :mod:`oar.vendor.scaffold`: ``oar new-backend``, a plugin project generated from the header
  and ``ops.yaml`` that builds on day one;
- :mod:`oar.vendor.ci`: ``oar ci render``, vendor CI configuration from jinja2 templates;
- :mod:`oar.vendor.abi`: the device ABI through cffi (``RawPlugin``: a plugin library's entry
  points called directly; ``PythonPlugin``: a plugin made of Python callables);
- :mod:`oar.vendor.abi_doc`: the header's doc comments parsed (the ABI reference, the scaffold);
- :mod:`oar.vendor.abi_layout`: the recorded layout of each released ABI version and its check;
- :mod:`oar.vendor.plugins`: the plugins bundled with oar (its own ``oar.plugins`` entry points).

Submodules are imported on use: ``import oar`` loads none of them.
"""
