"""What sits above the families: the stages a candidate launches around a compute-bound head (`tail`:
its prelude and tail, composed by the memory-bound families; `tail_render`: their text) and the partial
candidates that keep allowed torch ops as the head (`partial`)."""
