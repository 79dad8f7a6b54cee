import java.io.File;
import java.nio.file.Files;
import java.nio.file.Paths;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;

/**
 * keyshift's single-process HDFS for the cluster stack: one NameNode and one DataNode in this JVM
 * (Hadoop's MiniDFSCluster), every port fixed on loopback, so checkpoints can live on a real
 * Hadoop FileSystem (hdfs://) on one machine. Not a production HDFS: one replica, no security.
 *
 * Usage: java -cp ... MiniHdfs BASE_DIR NAMENODE_PORT READY_FILE
 * Ports: NAMENODE_PORT (RPC), +1 NameNode web UI, +2 data transfer, +3 DataNode web UI,
 * +4 DataNode IPC, +5 DataNode internal web server. READY_FILE gets the hdfs:// URI once up.
 */
public class MiniHdfs {
  public static void main(String[] args) throws Exception {
    String base = args[0];
    int port = Integer.parseInt(args[1]);
    String ready = args[2];
    long started = System.nanoTime();

    Configuration conf = new Configuration();
    conf.set(MiniDFSCluster.HDFS_MINIDFS_BASEDIR, new File(base).getAbsolutePath());
    conf.set("dfs.namenode.rpc-bind-host", "127.0.0.1");
    conf.set("dfs.namenode.http-address", "127.0.0.1:" + (port + 1));
    conf.setInt("dfs.replication", 1);
    conf.setBoolean("dfs.permissions.enabled", false);
    conf.setInt("dfs.namenode.handler.count", 4);
    conf.setInt("dfs.datanode.handler.count", 4);
    // with checkDataNodeAddrConfig the DataNode keeps these addresses instead of random ports
    conf.set("dfs.datanode.address", "127.0.0.1:" + (port + 2));
    conf.set("dfs.datanode.http.address", "127.0.0.1:" + (port + 3));
    conf.set("dfs.datanode.ipc.address", "127.0.0.1:" + (port + 4));
    conf.setInt("dfs.datanode.http.internal-proxy.port", port + 5);

    MiniDFSCluster cluster = new MiniDFSCluster.Builder(conf)
        .nameNodePort(port).nameNodeHttpPort(port + 1).numDataNodes(1)
        .format(true).waitSafeMode(true).checkDataNodeAddrConfig(true).build();
    cluster.waitActive();
    Runtime.getRuntime().addShutdownHook(new Thread(() -> {
      System.out.println("MiniHdfs: shutting down");
      cluster.shutdown();
    }));
    String uri = "hdfs://127.0.0.1:" + cluster.getNameNodePort();
    System.out.printf("MiniHdfs: ready at %s after %.1f s%n", uri, (System.nanoTime() - started) / 1e9);
    Files.writeString(Paths.get(ready), uri + "\n");
    Thread.currentThread().join();
  }
}
