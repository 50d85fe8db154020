"""`python -m gateway_client work|enqueue ...`"""

from .cli import main

main()
