"""``python -m epochal``: the ``epochal`` command without relying on a console script.

pip puts the ``epochal`` script in the interpreter's ``bin`` directory, which is not always
on ``PATH`` (pyenv needs ``pyenv rehash``, an inactive virtual environment, ``--user``
installs); ``python -m epochal`` always runs the command of the interpreter it names.
"""

from epochal.ops.cli import main

if __name__ == "__main__":
    main()
