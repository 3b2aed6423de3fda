/*
 * pgidgen next_id(): the seqlock over two sequences (docs/next_id.md), for spin.
 *
 * C is the counter (moved only by nextval: an atomic increment), B the offset (moved only under the shard's
 * generator lock). A caller is next_id(): the fast path reads B, nextval(C), reads B again and hands out C + B
 * when both reads agree (and the clock, free here, allows it); otherwise the slow path takes the lock, draws
 * B + nextval(C) and, if the clock says that value is behind, raises B and draws again. The advancer is
 * pgidgen.advance_generator(). Checked in every interleaving: no value is handed out twice, and each
 * caller's values increase.
 *
 *   spin -a seqlock.pml && gcc -DSAFETY -DCOLLAPSE -o pan pan.c && ./pan   errors: 0
 *   spin -DNO_SECOND_READ -a seqlock.pml ...      errors: 1 (a duplicate: the fast path's check is needed)
 *   spin -DNO_LOCK -a seqlock.pml ...             errors: 1 (raises and slow-path draws must not overlap)
 */
#define DRAWS 2

byte C = 0;
byte B = 0;
bool locked = false;
int lo = 0;        /* bit v of lo (v < 31) or of hi (v - 31): value v was handed out; values stay below 62 */
int hi = 0;

inline nextval(c) { d_step { C++; c = C } }
#ifdef NO_LOCK
inline acquire() { skip }
inline release() { skip }
#else
inline acquire() { atomic { !locked -> locked = true } }
inline release() { locked = false }
#endif
inline hand_out(v) {
    d_step {
        assert(v < 62);
        if
        :: v < 31 -> assert((lo & (1 << v)) == 0); lo = lo | (1 << v)
        :: else -> assert((hi & (1 << (v - 31))) == 0); hi = hi | (1 << (v - 31))
        fi
    };
    assert(v > last);
    last = v
}

proctype caller() {
    byte b1, b2, c, v, last = 0, n = 0;
    do
    :: n < DRAWS ->
        b1 = B;
        nextval(c);
#ifdef NO_SECOND_READ
        b2 = b1;
#else
        b2 = B;
#endif
        if
        :: b1 == b2 -> v = c + b1; hand_out(v)           /* fast path */
        :: true ->                                         /* slow path: the check failed, or the clock is ahead */
            acquire();
            b1 = B;
            nextval(c);
            v = c + b1;
            if
            :: skip                                        /* not behind the clock */
            :: B = b1 + 1; b1 = B; nextval(c); v = c + b1  /* behind: raise the offset, draw again */
            :: B = b1 + 3; b1 = B; nextval(c); v = c + b1
            fi;
            release();
            hand_out(v)
        fi;
        n++
    :: else -> break
    od
}

proctype advancer() {
    byte b, c;
    acquire();
    b = B;
    nextval(c);
    if
    :: 9 > c + b -> B = b + (9 - (c + b))
    :: else -> skip
    fi;
    release()
}

init {
    atomic {
        run caller();
        run caller();
        run advancer()
    }
}
