"""Ground truth: runs whose answer is known.

    expect.py     the `expect` block a planting command writes into a manifest, and the causes'
                  vocabulary (Cause, Direction) that the analyses answer in
    synthetic.py  simulated runs with a planted cause, written like recorded ones (no GPU)
"""
