"""Power cuts on a real filesystem: ext4 on a loop device, shut down mid-workload with the
kernel's ``EXT4_IOC_SHUTDOWN`` (``NOLOGFLUSH``), remounted, checked in a fresh process.

``disk`` (the image, the mount, the cut), ``workload`` (the child that drives the public API and
logs what was acknowledged), ``check`` (the verdict after the reboot), ``run`` (the driver).
``python -m tests.powercut --cuts 1000`` is the long run; ``tests/test_powercut.py`` the CI one.
See docs/reliability.md, "Power cuts on a real filesystem".
"""
