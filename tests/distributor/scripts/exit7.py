import os
import sys

print("exiting with 7 from rank", os.environ["RANK"])
sys.exit(7 if os.environ["RANK"] == "1" else 0)
