import horovod
import horovod.torch as hvd


def work(scale, offset=0):
    hvd.init()
    return hvd.rank() * scale + offset


if __name__ == "__main__":
    results = horovod.run(work, args=(10,), kwargs={"offset": 1}, np=2, use_gloo=True, verbose=2)
    print(results)
    single = horovod.run(work, (3,))
    elastic = horovod.run(work, args=(1,), np=2, min_np=1, max_np=4)
    print(horovod.__version__)
