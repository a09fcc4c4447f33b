"""spark-submit entry point of the staging writer job (``copier produce`` without the console script).

    spark-submit --py-files dist/copier-0.1.0/copier-0.1.0-py3-none-any.zip scripts/produce.py \
        --properties copier.properties --input s3://bucket/events/ --checkpoint s3://bucket/checkpoints/produce/

See README.md ("The staging writer") for the options that matter on a cluster.
"""

import argparse
import sys

from copier.commands.produce import add_arguments, main

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="produce.py", description=__doc__.splitlines()[0])
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
